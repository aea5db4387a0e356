/* fused.h — one element of an elementwise op, for the fused loops fsdpc
 * generates (passes/fuse.c, codegen/emit_fused.c).  The same text is
 * compiled into the cpu step (C11) and, embedded in fsdpc, into the cuda
 * kernels by NVRTC (-default-device makes these device functions), so the
 * two targets' fused code computes alike.
 *
 * kf_binary_S(op, a, b), kf_unary_S(op, x, p0, p1) and
 * kf_unary_grad_S(op, dy, x, y, p0, p1) follow the contracts of k_binary,
 * k_unary and k_unary_grad in kernels.h element by element, with the same
 * op codes; S is f32 or f64.  The generated code passes op as a constant, so
 * each switch folds to one expression.
 */
#ifndef FSDPC_FUSED_H
#define FSDPC_FUSED_H

#ifndef __CUDACC_RTC__
#include <math.h>
#elif !defined(INFINITY) /* NVRTC has no <math.h>; Clip's absent bounds are spelled INFINITY */
#define INFINITY __int_as_float(0x7f800000)
#endif

/* op codes: kernels.h's enums, repeated for NVRTC (which never sees
 * kernels.h); static_asserts in codegen/emit_fused.c keep them equal */
enum { KF_ADD, KF_SUB, KF_MUL, KF_DIV, KF_POW };
enum {
    KF_RELU, KF_TANH, KF_SIGMOID, KF_SQRT, KF_RECIPROCAL, KF_EXP, KF_LOG, KF_NEG, KF_ABS, KF_ERF,
    KF_LEAKY_RELU, KF_CLIP, KF_SOFTPLUS
};

#define KF_DEFINE(T, S, M)                                                                     \
    static inline T kf_binary_##S(int op, T a, T b)                                            \
    {                                                                                          \
        switch (op) {                                                                          \
        case KF_ADD: return a + b;                                                             \
        case KF_SUB: return a - b;                                                             \
        case KF_MUL: return a * b;                                                             \
        case KF_DIV: return a / b;                                                             \
        default: /* KF_POW: exponents 2 and 3 by multiplication, as torch */                   \
            return b == 2 ? a * a : b == 3 ? a * a * a : M(pow)(a, b);                         \
        }                                                                                      \
    }                                                                                          \
    static inline T kf_unary_##S(int op, T x, T p0, T p1)                                      \
    {                                                                                          \
        switch (op) {                                                                          \
        case KF_RELU: return x < 0 ? (T)0 : x; /* NaN passes */                                \
        case KF_TANH: return M(tanh)(x);                                                       \
        case KF_SIGMOID: return (T)1 / ((T)1 + M(exp)(-x));                                    \
        case KF_SQRT: return M(sqrt)(x);                                                       \
        case KF_RECIPROCAL: return (T)1 / x;                                                   \
        case KF_EXP: return M(exp)(x);                                                         \
        case KF_LOG: return M(log)(x);                                                         \
        case KF_NEG: return -x;                                                                \
        case KF_ABS: return M(fabs)(x);                                                        \
        case KF_ERF: return M(erf)(x);                                                         \
        case KF_LEAKY_RELU: return x > 0 ? x : x * p0;                                         \
        case KF_CLIP: { T v = x < p0 ? p0 : x; return v > p1 ? p1 : v; }                       \
        default: { /* KF_SOFTPLUS: p0 beta, p1 threshold */                                    \
            T bx = x * p0;                                                                     \
            return bx > p1 ? x : M(log1p)(M(exp)(bx)) / p0;                                    \
        }                                                                                      \
        }                                                                                      \
    }                                                                                          \
    static inline T kf_unary_grad_##S(int op, T dy, T x, T y, T p0, T p1)                      \
    {                                                                                          \
        switch (op) {                                                                          \
        case KF_RELU: return y <= 0 ? (T)0 : dy;                                               \
        case KF_TANH: return dy * ((T)1 - y * y);                                              \
        case KF_SIGMOID: return dy * ((T)1 - y) * y;                                           \
        case KF_SQRT: return dy / ((T)2 * y);                                                  \
        case KF_RECIPROCAL: return -dy * (y * y);                                              \
        case KF_EXP: return dy * y;                                                            \
        case KF_NEG: return -dy;                                                               \
        case KF_LOG: return dy / x;                                                            \
        case KF_ABS: return x > 0 ? dy : x < 0 ? -dy : (T)0;                                   \
        case KF_ERF: return dy * (T)1.1283791670955125739 * M(exp)(-x * x);                   \
        case KF_LEAKY_RELU: return x > 0 ? dy : dy * p0;                                       \
        case KF_CLIP: return x >= p0 && x <= p1 ? dy : (T)0;                                   \
        default: { /* KF_SOFTPLUS */                                                           \
            T bx = x * p0, z = M(exp)(bx);                                                     \
            return bx > p1 ? dy : dy * z / (z + (T)1);                                         \
        }                                                                                      \
        }                                                                                      \
    }

#define KF_M32(fn) fn##f
#define KF_M64(fn) fn
KF_DEFINE(float, f32, KF_M32)
KF_DEFINE(double, f64, KF_M64)
#undef KF_DEFINE

#endif
